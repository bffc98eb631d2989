"""The rule registry of ``colabkit migrate``: one declarative record per Colab-only construct.

A rule says what it matches, what the fix is and whether migrate applies it (``automatic``) or only reports it.
The tables below (Colab functions by qualified name, shell commands, magics) are what the rewriter looks things up
in; adding a Colab function with a portable equivalent is one line in ``CALLS``.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rule:
    code: str          # "CK101"
    name: str          # "drive-mount": a stable slug, usable in --rules
    title: str         # one line for --list-rules and the report
    matches: str       # what is matched, in words
    fix: str           # what migrate writes instead (or why it leaves it)
    automatic: bool    # True: migrate rewrites it; False: reported only
    manual: str = ""   # what the user still has to do by hand, if anything
    extras: tuple = ()  # colabkit extras the rewritten code needs


RULES = (
    Rule("CK001", "syntax-error", "cell is not valid Python",
         "a code cell that does not parse, even after IPython's magics and shell escapes are accounted for",
         "the cell is left exactly as it is", False,
         "fix the syntax error, then run colabkit migrate again for this cell"),
    Rule("CK002", "not-analysed", "cell skipped",
         "a code cell IPython would strip before running (prompts such as '>>>', indentation of the whole cell), "
         "a cell too large to read (more than 10,000 lines or 2,000,000 characters: generated data, not code), "
         "or a multi-line shell escape whose words cannot be located",
         "the cell or line is left exactly as it is", False, "check this cell by hand"),
    Rule("CK003", "install-cell", "install colabkit where it is missing",
         "a migrated notebook whose cells now use colabkit and that does not install colabkit itself",
         "a new code cell before the first one: 'try: import colabkit', and on ImportError '%pip install -q "
         "colabkit' (with the extras the notebook needs), so the notebook starts on a fresh Colab runtime; it "
         "installs nothing where colabkit is already there, and is not added again", True),
    Rule("CK101", "drive-mount", "mount Google Drive portably",
         "google.colab.drive.mount(...) however imported (drive.mount, google.colab.drive.mount, mount)",
         "colabkit.mount_drive(...): on Colab the same mount; elsewhere Drive is the drive_root folder. A literal "
         "Colab mount point argument is dropped (all Drive paths go through colabkit.drive())", True,
         "point drive_root at your Drive on this machine (Google Drive for desktop, rclone) or copy the files used "
         "into ~/colabkit-drive"),
    Rule("CK102", "drive-path", "path in My Drive",
         "'/content/drive/MyDrive/...' in Python strings (plain, raw, f-strings), in shell escapes and in %cd",
         "colabkit.drive('...') in Python; {colabkit.drive('...', quoted=True)} in shell commands", True),
    Rule("CK103", "drive-path-old", "old Drive mount point or folder name",
         "'/content/drive/My Drive/...', '/content/gdrive/...', '/gdrive/...' and 'drive/MyDrive/...' relative "
         "to /content",
         "colabkit.drive('...'), as for CK102", True),
    Rule("CK104", "drive-outside-mydrive", "Drive path outside My Drive",
         "the bare mount point '/content/drive' or a folder beside My Drive (Shareddrives, .shortcut-targets-by-id)",
         "reported only: there is no portable equivalent", False,
         "use colabkit.drive('...') for files in My Drive, or give this path a local equivalent"),
    Rule("CK105", "drive-flush", "flush and unmount Drive",
         "google.colab.drive.flush_and_unmount(...)",
         "colabkit.flush_and_unmount_drive(...): the same on Colab; elsewhere files are already on disk", True),
    Rule("CK106", "drive-path-escaped-space", "shell-style escaped space in a Drive path",
         "'/content/drive/My\\ Drive/...' (a backslash before the space, copied from a shell line) in Python "
         "strings and form fields",
         "colabkit.drive('...'), as for CK102: the escape was never part of the folder's name", True),
    Rule("CK107", "drive-mount-check", "check for the Drive mount point",
         "os.path.exists / isdir / lexists / ismount('/content/drive') (also '/content/gdrive', a trailing '/', "
         "or '.../MyDrive'): the usual 'mount unless mounted' test",
         "colabkit.drive_mounted(): on Colab whether Drive is mounted (it never mounts), elsewhere whether the "
         "drive_root folder is there, so the branch goes the right way on both", True),
    Rule("CK108", "path-in-text", "Colab path used as text",
         "a Colab path inside a longer string (PYTHONPATH lists, messages) or as an argument of a string method "
         "(.replace('/content/drive/', ''), .startswith(...), ...)",
         "left as it is. Where the text is only shown (print, f-strings, logging) nothing is reported: at home it "
         "prints the full local path, which is harmless. Otherwise it is reported", False,
         "this string treats a Colab path as text; at home it does not match: use colabkit.drive() / "
         "colabkit.workdir() for the prefix"),
    Rule("CK109", "drive-link", "link to Drive at the filesystem root",
         "'!ln -s /content/drive/MyDrive /mydrive' or os.symlink(...) (a link at the root to a Colab path), and the "
         "paths through it ('/mydrive/data/x.csv') in every cell",
         "the paths through the link become colabkit.drive('data/x.csv') (colabkit.workdir for /content), like the "
         "paths they stand for; the link is made only on Colab ('if colabkit.on_colab():'). A link elsewhere "
         "outside the working folder (/root/.kaggle) is reported", True,
         "use the portable path of the link's target where the notebook uses the link"),
    Rule("CK110", "config-text", "Colab path in text written to a file",
         "Colab paths in a multi-line string (a TOML or YAML training config the notebook writes to a file) and in "
         "the text of a %%writefile cell",
         "the text becomes an f-string giving the same text with {colabkit.drive('...')} / "
         "{colabkit.workdir('...')} in place of each path (its braces doubled); a %%writefile cell becomes the "
         "call IPython makes for it, get_ipython().run_cell_magic('writefile', ..., rf\"\"\"...\"\"\"). Text "
         "that is only shown, and docstrings, stay as they are", True),
    Rule("CK201", "content-path", "path under /content",
         "'/content/...' (not Drive) in Python strings, shell escapes and magics: Colab's working area",
         "colabkit.workdir('...'): /content on Colab, the notebook's folder (COLABKIT_WORKDIR) elsewhere", True),
    Rule("CK202", "content-cwd", "hard-coded working directory",
         "%cd /content... and os.chdir('/content...')",
         "%cd {colabkit.workdir('...')} / os.chdir(colabkit.workdir('...')) (colabkit.drive for Drive folders)",
         True),
    Rule("CK203", "pip-install", "!pip becomes %pip",
         "!pip, !pip3, !python -m pip and !{sys.executable} -m pip shell escapes",
         "%pip ...: installs into the kernel's own environment, on Colab and at home. Lines with shell "
         "redirections or pipes are reported instead", True),
    Rule("CK204", "apt-get", "system package install",
         "!apt-get / !apt / !sudo apt... install",
         "reported only: needs root and a Debian-like system", False,
         "install these system packages with your package manager"),
    Rule("CK205", "nvidia-smi", "nvidia-smi kept, safe without a GPU",
         "!nvidia-smi (alone or with options), also in x = !nvidia-smi",
         "!nvidia-smi || echo \"...\": prints an explanation instead of a shell error where there is no NVIDIA "
         "driver", True),
    Rule("CK206", "kaggle-json", "Kaggle credentials",
         "shell commands that copy kaggle.json into ~/.kaggle",
         "kept as they are", False,
         "put kaggle.json into ~/.kaggle/ on this machine (chmod 600) and into the uploads folder"),
    Rule("CK207", "shell-cell", "%%shell becomes %%bash",
         "the Colab-only cell magic %%shell",
         "%%bash, which both Colab and IPython have", True, "bash must be installed (it is on Linux and macOS)"),
    Rule("CK208", "shell-cell-path", "Colab path inside a shell cell",
         "Colab paths in the body of %%bash / %%sh / %%shell / %%script cells",
         "reported only: a shell cell cannot call colabkit", False,
         "replace the path, e.g. with a Python cell using colabkit.drive() / colabkit.workdir()"),
    Rule("CK209", "shell-continued", "Colab path in a shell escape continued over several lines",
         "'!cmd ... \\' followed by more lines: the paths on every line (quoted or not, --opt=value included)",
         "each path as on one line: {colabkit.drive('...', quoted=True)} / {colabkit.workdir('...', quoted=True)}; "
         "lines using $ expansion or unbalanced quotes are reported", True,
         "replace the path by hand (colabkit.drive() / colabkit.workdir())"),
    Rule("CK210", "cell-magic-below-comments", "cell magic below comment lines",
         "comment lines (a note, a form title) above a cell magic such as %%shell or %%capture: Colab runs the "
         "magic, IPython only when it is the cell's first line (otherwise the cell is a SyntaxError)",
         "the magic line(s) move to the top and the comments right below them, where the body reads them as "
         "comments (shell, Python); otherwise reported", True,
         "make the cell magic the first line and move the comments to a markdown cell"),
    Rule("CK301", "colab-import", "google.colab import",
         "import google.colab / from google.colab[.x] import ...",
         "import colabkit when every use has a portable equivalent; otherwise the import is kept under "
         "'if colabkit.on_colab():'", True),
    Rule("CK302", "files-upload", "upload files",
         "google.colab.files.upload()",
         "colabkit.upload(): the Colab dialog on Colab; elsewhere the files in the uploads folder", True,
         "put the files to upload into an 'uploads' folder next to the notebook (or set COLABKIT_UPLOADS)"),
    Rule("CK303", "files-download", "download a file",
         "google.colab.files.download(path)",
         "colabkit.download(path): the browser download on Colab; elsewhere prints where the file is", True),
    Rule("CK304", "secrets", "notebook secret",
         "google.colab.userdata.get('NAME')",
         "colabkit.secret('NAME'): Colab's secret on Colab, the environment variable NAME elsewhere", True,
         "set the environment variable(s) before starting Jupyter"),
    Rule("CK305", "auth", "Google Cloud sign-in",
         "google.colab.auth.authenticate_user(...)",
         "colabkit.authenticate_user(...): the Colab sign-in on Colab; elsewhere Application Default Credentials",
         True, "run once on this machine: gcloud auth application-default login"),
    Rule("CK306", "cv2-imshow", "cv2_imshow",
         "google.colab.patches.cv2_imshow(image)",
         "colabkit.cv2_imshow(image): the same picture, shown with IPython.display elsewhere", True,
         extras=("notebook",)),
    Rule("CK307", "colab-output", "google.colab.output / eval_js",
         "google.colab.output.eval_js, register_callback and other output functions (except those in CK308)",
         "reported only: they need Colab's browser frontend", False,
         "rewrite this by hand (e.g. ipywidgets or IPython.display), or put it under 'if colabkit.on_colab():'"),
    Rule("CK308", "colab-only-call", "Colab-only call guarded",
         "statements whose only effect is on Colab: output.enable_custom_widget_manager(), runtime.unassign(), "
         "data_table.enable_dataframe_formatter(), files.view(), %load_ext google.colab.*",
         "the statement runs under 'if colabkit.on_colab():'", True),
    Rule("CK309", "colab-api", "other google.colab use",
         "any other use of google.colab that has no portable equivalent",
         "reported only", False, "rewrite this by hand, or put it under 'if colabkit.on_colab():'"),
    Rule("CK310", "tensorflow-version", "%tensorflow_version",
         "the Colab-only magic %tensorflow_version",
         "commented out: it has no effect on today's Colab (TensorFlow 2 is the only version)", True),
    Rule("CK311", "condacolab", "condacolab runs only on Colab",
         "import condacolab and condacolab.install() / .check() ...: a Colab-only installer (it puts conda into "
         "Colab's Python and restarts the runtime; elsewhere its import raises)",
         "those statements run under 'if colabkit.on_colab():'", True,
         "start Jupyter from a conda (or mamba) environment with the packages the notebook installs with conda"),
    Rule("CK312", "colab-env", "environment variable only Colab sets",
         "os.environ['COLAB_TPU_ADDR'] (COLAB_GPU, COLAB_RELEASE_TAG, any COLAB_*) read where nothing makes sure "
         "it is set: elsewhere it raises KeyError",
         "reported with the read that does not raise, os.environ.get('COLAB_...') (None off Colab)", False,
         "read it with os.environ.get(...) and handle None, or run it under 'if colabkit.on_colab():'"),
    Rule("CK401", "forms", "Colab form kept",
         "#@title, #@param and #@markdown form comments",
         "kept: Colab shows a form, elsewhere they are plain comments and the values are the defaults", False),
    Rule("CK402", "form-path", "Colab path in a form field",
         "a '#@param' field whose value is a Colab path",
         "the field is kept editable; a line after it maps the value: x = colabkit.portable_path(x)", True),
    Rule("CK501", "training-script", "training script: run it under colabkit guard",
         "a shell line that runs a training script writing checkpoints: !python / !python3 train*.py, "
         "finetune*.py, !accelerate launch, !torchrun, !deepspeed, !python -m accelerate.commands.launch, or a "
         "script given --output_dir / --save_steps / --checkpointing_steps / a resume option (also in %%bash and "
         "%%shell cells)",
         "reported with the line run under the guard, ready to paste: colabkit guard --watch FOLDER (from "
         "--output_dir, --save_dir, --checkpoint_dir, --project/--name, ...) --to drive:runs/NAME --resume-arg "
         "\"--resume_from_checkpoint={latest}\" (where the line shows the script's resume option) -- COMMAND; the "
         "guard commits the checkpoints to Drive and relaunches the script from the last one. A %%guard cell, or "
         "colabkit.guard.run(command, watch=..., to=..., resume_arg=...) from Python, does the same", False),
    Rule("CK502", "hf-trainer", "transformers Trainer: resume it with colabkit.hf.AutoResume",
         "Trainer(...) constructed, or a trainer built on it (Seq2SeqTrainer, TRL's SFTTrainer, DPOTrainer, "
         "GRPOTrainer, ORPOTrainer, RewardTrainer, ..., a subclass the notebook defines), imported from "
         "transformers or trl",
         "reported with the lines to add: ar = colabkit.hf.AutoResume(\"drive:runs/NAME\", every=\"15min\"), "
         "callbacks=[ar] in the trainer's arguments, trainer.train(resume_from_checkpoint=ar.resume_from)", False),
    Rule("CK503", "accelerate-loop", "accelerate loop: resume it with colabkit.hf.AccelerateResume",
         "Accelerator(...) constructed (imported from accelerate) or accelerator.save_state(...) called: a training "
         "loop of the notebook's own on accelerate",
         "reported, suggesting colabkit.hf.AccelerateResume (for accelerate loops: Accelerator.save_state to Drive "
         "on a schedule, load_state on resume)", False),
)

BY_CODE = {rule.code: rule for rule in RULES}
BY_NAME = {rule.name: rule for rule in RULES}

# google.colab functions with a portable equivalent: qualified name -> (rule code, replacement for the callee).
CALLS = {
    "google.colab.drive.mount": ("CK101", "colabkit.mount_drive"),
    "google.colab.drive.flush_and_unmount": ("CK105", "colabkit.flush_and_unmount_drive"),
    "google.colab.files.upload": ("CK302", "colabkit.upload"),
    "google.colab.files.download": ("CK303", "colabkit.download"),
    "google.colab.userdata.get": ("CK304", "colabkit.secret"),
    "google.colab.auth.authenticate_user": ("CK305", "colabkit.authenticate_user"),
    "google.colab.patches.cv2_imshow": ("CK306", "colabkit.cv2_imshow"),
}

# Calls whose only effect is on Colab: a statement consisting of one of them is guarded (CK308).
GUARD_CALLS = frozenset({
    "google.colab.output.enable_custom_widget_manager",
    "google.colab.output.disable_custom_widget_manager",
    "google.colab.output.no_vertical_scroll",
    "google.colab.output.clear",
    "google.colab.output.serve_kernel_port_as_window",
    "google.colab.output.serve_kernel_port_as_iframe",
    "google.colab.runtime.unassign",
    "google.colab.data_table.enable_dataframe_formatter",
    "google.colab.data_table.disable_dataframe_formatter",
    "google.colab.files.view",
})

# Prefixes of google.colab names reported under a specific rule; anything else in google.colab is CK309.
REPORT_PREFIXES = (("google.colab.output", "CK307"),)

# Mount point literals dropped from drive.mount(...): colabkit mounts where it resolves "drive:" paths.
COLAB_MOUNTPOINTS = frozenset({"/content/drive", "/content/drive/", "/content/gdrive", "/content/gdrive/",
                               "/gdrive", "/gdrive/"})

# Cell magics whose body is Python (analysed like a cell).
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# Line magics whose argument is one raw path (no shell quoting) and those whose arguments are shell-like words.
RAW_PATH_MAGICS = frozenset({"cd"})
WORD_MAGICS = frozenset({"run", "load", "pycat", "ls", "cp", "mv", "rm", "mkdir", "rmdir", "cat", "pip",
                         "writefile"})

def requirement(extras) -> str:
    """The pip requirement for colabkit with ``extras``: 'colabkit' or 'colabkit[a,b]'."""
    extras = sorted(set(extras))
    return f"colabkit[{','.join(extras)}]" if extras else "colabkit"


NVIDIA_SMI_FALLBACK = ' || echo "colabkit: nvidia-smi failed or is missing (no NVIDIA GPU driver here)"'


def select(rules=None, ignore=None) -> frozenset:
    """The codes of the active rules. ``rules``/``ignore``: codes ("CK101"), names ("drive-mount") or code
    prefixes ("CK1" = every CK1xx rule), as an iterable or a comma-separated string. Unknown entries raise
    ValueError naming them and the known rules."""
    def expand(spec, what):
        if spec is None:
            return None
        items = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
        chosen = set()
        for item in items:
            key = str(item).strip()
            if not key:
                continue
            upper = key.upper()
            if upper in BY_CODE:
                chosen.add(upper)
            elif key.lower() in BY_NAME:
                chosen.add(BY_NAME[key.lower()].code)
            elif upper.startswith("CK") and any(code.startswith(upper) for code in BY_CODE):
                chosen.update(code for code in BY_CODE if code.startswith(upper))
            else:
                raise ValueError(f"Unknown rule {key!r} in {what}; known rules: "
                                 f"{', '.join(r.code + ' (' + r.name + ')' for r in RULES)}.")
        return chosen

    active = expand(rules, "--rules")
    active = set(BY_CODE) if active is None else active
    return frozenset(active - (expand(ignore, "--ignore") or set()))


def rule_table() -> str:
    """The rule list as text (``colabkit migrate --list-rules``)."""
    lines = []
    for rule in RULES:
        mode = "auto" if rule.automatic else "report"
        lines.append(f"{rule.code}  {rule.name:<22} {mode:<7} {rule.title}")
        lines.append(f"       matches: {rule.matches}")
        lines.append(f"       fix:     {rule.fix}")
        if rule.manual:
            lines.append(f"       by hand: {rule.manual}")
    return "\n".join(lines)
